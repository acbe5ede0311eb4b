/** Raised at set-up time (never inside an agent call) for a configuration that cannot work. */
export class LoopwardenConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'LoopwardenConfigError';
  }
}
