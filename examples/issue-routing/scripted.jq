# [SIMULATED] Keyword rules standing in for a model in tests. They read
# only what each stage shows, like a model would; what they find is a
# property of these rules, not of any model.
def crash_re: "crash|panic|segfault|SIGSEGV|fatal error";
def crash_sentence: [(.body // "") | match("[^.\n]*(" + crash_re + ")[^.\n]*"; "i") | .string] | first;
if has("records") then
  # The chunk stage: several long reports in one context.
  {matches: [.records[] | select(.record.body // "" | test(crash_re; "i")) | .id]}
elif has("chars") then
  # The router: what no rule decided, by length.
  if .chars > 800 then {choice: "long", _scores: {short: 0.1, long: 0.8, with_pr: 0.1}}
  else {choice: "short", _scores: {short: 0.8, long: 0.1, with_pr: 0.1}} end
else
  # A judge: a crash, unless the pull request it names is merged.
  (crash_sentence) as $quote
  | (($quote != null) and ((.pr.merged // false) | not)) as $unfixed
  | {decision: (if $unfixed then "crash" else "no_crash" end),
     evidence: (if $unfixed and ($quote | length) >= 8 then [{field: "body", quote: $quote[0:120]}] else [] end)}
end
