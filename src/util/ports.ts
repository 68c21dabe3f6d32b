import { isIP } from 'node:net'

/** A listen that failed on a taken address, naming the config key: the default ports are often held by another local service (a developer's own anvil on 8545). */
export const portTaken = (key: string, host: string, port: number): Error =>
  new Error(`${key} = ${port}: ${host}:${port} is already in use (EADDRINUSE); stop what holds it or choose another port (0 picks a free one)`)

/** A bind address only this machine can reach: `localhost`, 127.0.0.0/8 or ::1. */
export const isLoopback = (host: string): boolean => host === 'localhost' || (isIP(host) !== 0 && /^(127\.|::1$)/.test(host))
