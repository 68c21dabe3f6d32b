"""A sub-agent for POST /v1/agents/invoke (Python 3.9+, standard library only).

PAYGATE_API=http://127.0.0.1:8403 SUB_AGENT_ID=summarizer SUB_AGENT_KEY=rp_agent_... python3 sub_agent.py
"""
import json
import os
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

API = os.environ.get("PAYGATE_API", "http://127.0.0.1:8403")
AGENT_ID = os.environ["SUB_AGENT_ID"]
KEY = os.environ["SUB_AGENT_KEY"]
PORT = int(os.environ.get("PORT", "9000"))


def pay_inside(token, endpoint):
    """Pay for one resource inside the invocation: the token makes it count against the cap."""
    req = urllib.request.Request(
        f"{API}/v1/pay",
        data=json.dumps({"agentId": AGENT_ID, "endpoint": endpoint}).encode(),
        headers={
            "Authorization": f"Bearer {KEY}",
            "Content-Type": "application/json",
            "X-Paygate-Invocation": token,
        },
        method="POST",
    )
    try:
        with urllib.request.urlopen(req) as res:
            body = json.load(res)
            return {"data": body["data"], "txHash": body["txHash"]}
    except urllib.error.HTTPError as e:
        body = json.load(e)
        if e.code == 402 and body.get("error") == "budget_exceeded":
            return {"stopped": body["detail"]}
        raise RuntimeError(f"{body.get('error')}: {body.get('detail')}")


class SubAgent(BaseHTTPRequestHandler):
    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        task = json.loads(self.rfile.read(length) or b"{}").get("task") or {}
        token = self.headers["X-Paygate-Invocation"]
        remaining = self.headers.get("X-Paygate-Budget-Remaining")
        try:
            results = []
            for source in task.get("sources", []):
                r = pay_inside(token, source)
                if "stopped" in r:  # the cap is reached: answer with what we have
                    break
                results.append(r["data"])
            self.answer(200, {"output": {"results": results, "budgetAtStart": remaining}})
        except Exception as e:  # noqa: BLE001 - the orchestrator sees 502 sub_agent_failed
            self.answer(500, {"error": str(e)})

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", PORT), SubAgent).serve_forever()
