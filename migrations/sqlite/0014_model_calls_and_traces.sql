-- zincir schema, version 14: model calls in flight, and the trace a run belongs to.
--   agent_runs.model_call_seq
--                     the seq of the run's open model-call mark (its model_call_started event):
--                     a call was placed and no reply is recorded for it yet. NULL: none. The
--                     reply recorded (llm_call) closes it; a mark its attempt left open is
--                     charged to the budget by its request size (model_call_lost) when the
--                     owner places its next mark, or when the next owner takes the run
--   agent_runs.traceparent
--                     the W3C trace context the run's spans continue (00-<trace>-<span>-<flags>),
--                     set when the run was created with tracing on; NULL: none

ALTER TABLE agent_runs ADD COLUMN model_call_seq INTEGER;
ALTER TABLE agent_runs ADD COLUMN traceparent TEXT;
