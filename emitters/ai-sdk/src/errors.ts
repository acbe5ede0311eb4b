/** Raised at set-up time (never inside an agent call) for a configuration that cannot work. */
export class LoopwardenConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'LoopwardenConfigError';
  }
}

/**
 * Raised at once by a call that resumes an approval on a run handle whose segment numbering would
 * start over (its events would be ignored as duplicates of the run's first segment).
 */
export class LoopwardenResumeError extends LoopwardenConfigError {
  constructor(message: string) {
    super(message);
    this.name = 'LoopwardenResumeError';
  }
}
