# [SIMULATED] Follows the rubrics by rule. Alone, a bug report is `unsure`.
# Widened, it is a regression when a related issue is closed with a fix.
if has("related") then
  [.related[] | select(.record.state == "CLOSED" and ((.record.body // "") | test("fixed (in|by) #"; "i")))] as $fixed
  | if ($fixed | length) > 0
    then {decision: "regression", evidence: [{field: "title", quote: .title}]}
    else {decision: "not_regression", evidence: [{field: "title", quote: .title}]}
    end
else
  {decision: "unsure", evidence: []}
end
