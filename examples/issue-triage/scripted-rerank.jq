# [SIMULATED] The reranker `fanfold bench ladder --backend scripted` gives
# the `rerank` strategy: every unit relevant, scored as the embedded model
# scores its answer. It tests the harness and ranks nothing.
{relevant: "yes", _scores: {yes: 0.9, no: 0.1}}
