# [SIMULATED] A keyword lister standing in for a model that reads many
# lines in one context (the chunk and long-context strategies of `fanfold
# bench ladder --backend scripted`). Its precision and recall are a property
# of these rules, not of any model.
def failing: (.Content // "") | test("fail|error|exception|interrupt|terminated|assert|lost|cannot"; "i")
  and (test("corrected"; "i") | not);
{matches: [.records[] | select(.record | failing) | .id]}
