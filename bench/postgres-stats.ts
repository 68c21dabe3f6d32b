/**
 * What the replicas benchmark (`replicas.ts`) measures of PostgreSQL: the cluster's CPU from
 * /proc and the statements each phase ran (pg_stat_statements).
 */
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import pg from 'pg'
import type { PgCluster } from '../test/helpers/postgres.js'
import { descendants } from './lib.js'

/** Statements by normalised text: how often each ran and its time in all. */
export type Statements = Map<string, { calls: number; ms: number }>

/** CPU ms of a process from /proc: its own (utime, stime) and, with `reaped`, its exited children's (cutime, cstime). */
function cpuOf(pid: number, reaped: boolean): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
    const ticks = Number(f[11]) + Number(f[12]) + (reaped ? Number(f[13]) + Number(f[14]) : 0)
    return ticks * 10 // USER_HZ is 100
  } catch {
    return 0
  }
}

/**
 * CPU ms used so far by the cluster: the postmaster, the backends it reaped (the pools close
 * idle connections, so backends come and go) and the live ones.
 */
export function postgresCpu(cluster: PgCluster): number {
  const postmaster = Number(readFileSync(join(cluster.dir, 'data', 'postmaster.pid'), 'utf8').split('\n')[0])
  return cpuOf(postmaster, true) + descendants(postmaster).reduce((s, pid) => s + cpuOf(pid, false), 0)
}

export async function pgQuery<R extends pg.QueryResultRow>(url: string, sql: string): Promise<R[]> {
  const c = new pg.Client({ connectionString: url })
  await c.connect()
  try {
    return (await c.query<R>(sql)).rows
  } finally {
    await c.end()
  }
}

export const THIS_DB = '(SELECT oid FROM pg_database WHERE datname = current_database())'

/** pg_stat_statements of this database since its last reset, added into `into`. */
export async function addStatements(url: string, into: Statements): Promise<void> {
  const rows = await pgQuery<{ query: string; calls: string; ms: number }>(
    url,
    `SELECT query, calls::text, total_exec_time AS ms FROM pg_stat_statements WHERE dbid = ${THIS_DB} AND query NOT LIKE '%pg_stat_statements%'`,
  )
  for (const r of rows) {
    const q = r.query.replace(/\s+/g, ' ').replace(/\$\d+/g, '$n')
    const s = into.get(q) ?? { calls: 0, ms: 0 }
    s.calls += Number(r.calls)
    s.ms += r.ms
    into.set(q, s)
  }
}
