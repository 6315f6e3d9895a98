# [SIMULATED] A rule-following group judge: the group contradicts itself
# when one issue says it cannot reproduce; it is duplicates when every
# title opens with the same two words; else unrelated. It quotes every
# issue's title.
to_entries as $e
| [$e[] | select(.key | endswith(".title"))] as $titles
| ([$e[] | select(.key | endswith(".body")) | .value | ascii_downcase | contains("cannot reproduce")] | any) as $denied
| ([$titles[] | .value | split(" ") | .[0:2] | join(" ") | ascii_downcase] | unique | length) as $openings
| {relation: (if $denied then "contradict" elif $openings == 1 then "duplicates" else "unrelated" end),
   evidence: [$titles[] | {field: .key, quote: .value}]}
