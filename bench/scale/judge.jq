# [SIMULATED] A keyword judge: the scale benchmark measures the engine.
{
  decision: (if (.msg | test("upstream|502|deadline")) then "upstream" else "other" end),
  service: .service
}
