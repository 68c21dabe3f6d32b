# Paygate: multi-stage build, non-root runtime.
# Not built in the development environment (no Docker daemon there); kept deliberately simple.
FROM node:20-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY scripts/build-web.mjs scripts/bundle.mjs ./scripts/
COPY src ./src
COPY web ./web
COPY config ./config
# The server (tsc, then bundled into dist/paygate.js) and the dashboard (Vite, into dist/web).
RUN npm run build

FROM node:20-bookworm-slim
ENV NODE_ENV=production \
    PAYGATE_API_HOST=0.0.0.0 \
    PAYGATE_PROXY_HOST=0.0.0.0 \
    PAYGATE_DATA_DIR=/data \
    PAYGATE_CERTS_DIR=/certs
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund && npm cache clean --force
COPY --from=build /app/dist ./dist
COPY config ./config
# Served at GET /v1/openapi.json.
COPY docs/openapi.json ./docs/openapi.json
RUN mkdir -p /data /certs && chown node:node /data /certs
USER node
VOLUME ["/data", "/certs"]
EXPOSE 8402 8403
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s \
  CMD ["node", "-e", "fetch('http://127.0.0.1:'+(process.env.PAYGATE_API_PORT||8403)+'/healthz').then(r=>process.exit(r.ok?0:1),()=>process.exit(1))"]
# Node flags as `npm start` has them (docs/operations.md).
CMD ["node", "--max-semi-space-size=64", "dist/paygate.js"]
