/**
 * @loopwarden/ai-sdk — publish content-free run, step and stop records of AI SDK agents to
 * loopwarden (the contract: docs/contract.md in the loopwarden repository). See README.md for the integration.
 */
export {
  createLoopwarden,
  Loopwarden,
  WatchedAgent,
  AgentRun,
  TextRun,
  type LoopwardenOptions,
  type LoopwardenStats,
  type PolicyOptions,
  type RunOptions,
  type ReceiptInput,
  type ApprovalRouter,
  type ApprovalRouting,
  type ApprovalRequestInfo,
} from './instrument.js';
export {
  isStepCount,
  stepCountIs,
  hasToolCall,
  isLoopFinished,
  tokenBudget,
  namedCondition,
  describeCondition,
  stepTokens,
  type AnyStopCondition,
} from './conditions.js';
export { MemorySink, KafkaSink, RateLimitedLog, kafkaLogLine, type Sink, type SinkRecord, type KafkaSinkOptions, type SinkLogger } from './sinks.js';
export { Publisher, PRIORITY, type PublisherOptions, type PublisherStats } from './publisher.js';
export { summarizeStep, deriveBoundaryCause, clipId, type StepSummary, type CallOutcome, type BoundaryVerdict } from './steps.js';
export { sdkEvaluatesAfter } from './sdk-internals.js';
export { LoopwardenConfigError, LoopwardenResumeError } from './errors.js';
export {
  KafkaActionSource,
  MemoryActionSource,
  ActionHandlingStopped,
  type ActionSource,
  type ActionRecordHandler,
  type ActionStats,
  type ActionSubscription,
  type KafkaActionSourceOptions,
  type OnActionOptions,
} from './actions.js';
export * from './receipts.js';
export * from './events.js';
