/** A listen that failed on a taken address, naming the config key: the default ports are often held by another local service (a developer's own anvil on 8545). */
export const portTaken = (key: string, host: string, port: number): Error =>
  new Error(`${key} = ${port}: ${host}:${port} is already in use (EADDRINUSE); stop what holds it or choose another port (0 picks a free one)`)
