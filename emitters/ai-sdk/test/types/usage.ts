// Type-level test (compiled with `tsc --noEmit` by `npm test`): the README integration compiles
// against the installed `ai` types, the factories fit `stopWhen`, and the run handle keeps the
// agent's own parameter and result types.
import { ToolLoopAgent, jsonSchema, tool, type GenerateTextResult } from 'ai';
import { MockLanguageModelV4 } from 'ai/test';
import {
  createLoopwarden,
  hasToolCall,
  isStepCount,
  KafkaActionSource,
  KafkaSink,
  MemorySink,
  namedCondition,
  tokenBudget,
  type RecoveryAction,
  type RunEnded,
  type StepsEvent,
} from '../../src/index.js';

const tools = {
  search: tool({ inputSchema: jsonSchema<{ q: string }>({ type: 'object' }), execute: async ({ q }) => q.length }),
  done: tool({ inputSchema: jsonSchema<{ summary: string }>({ type: 'object' }) }),
};

export async function readmeIntegration(model: MockLanguageModelV4, runId: string) {
  const agent = new ToolLoopAgent({
    model,
    tools,
    stopWhen: [isStepCount(20), hasToolCall('done'), tokenBudget(50_000), namedCondition('slow', 'bound', ({ steps }) => steps.length > 5)],
  });
  const lw = createLoopwarden({ sink: new KafkaSink({ brokers: ['localhost:9092'] }), agent: 'invoice-agent', policyVersion: 'v3' });
  const watched = lw.instrument(agent);
  const result = await watched.run(runId).generate({ prompt: 'Create the invoice', onStepFinish: (step) => void step.stepNumber });
  const typed: GenerateTextResult<typeof tools, any, never> = result;
  await lw.close();
  return typed;
}

export function events(sink: MemorySink): RunEnded[] {
  return sink.events().filter((e): e is RunEnded => e.type === 'run_ended');
}

export const example: StepsEvent = { type: 'approval_resolved', run_id: 'r', ts: 0, approval_id: 'a', approved: true };

// The README's recovery: onAction's handler gets a typed action, and run() takes it as `recovers`.
export function readmeRecovery(agent: ToolLoopAgent<never, typeof tools>, page: (to: string | null, why: string) => Promise<void>) {
  const lw = createLoopwarden({
    sink: new KafkaSink({ brokers: ['kafka:9092'] }),
    actions: new KafkaActionSource({ brokers: ['kafka:9092'] }),
    agent: 'invoice-agent',
    recovery: { max_attempts: 3, on: { STUCK: 'resume' }, backoff_s: 30, escalate_to: 'invoices-oncall' },
  });
  const watched = lw.instrument(agent);
  return lw.onAction(async (action: RecoveryAction) => {
    if (action.action === 'resume' || action.action === 'restart') {
      await watched.run(`${action.job_id}-a${action.next_attempt}`, { recovers: action }).generate({ prompt: 'again' });
    } else if (action.action === 'escalate') {
      await page(action.escalate_to, action.reason);
    }
  });
}
