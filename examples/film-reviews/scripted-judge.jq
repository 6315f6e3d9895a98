# [SIMULATED] A phrase judge standing in for a model in tests. It reads
# only the review's text, like a model would; how often it is right is a
# property of these rules and of the fixture's phrasing, not of any model.
def levels: [
  [1, "waste of two hours|Dreadful|unwatchable"],
  [2, "dull|disappointing|Weak writing"],
  [3, "liked it more than not|won me over|left me cold|did not enjoy"],
  [4, "really good|enjoyed it a lot|Well made"],
  [5, "flawless|masterpiece|Brilliant"]
];
def leans_negative: test("left me cold|did not enjoy");
def sentence($re): [match("[^.;]*(" + $re + ")[^.;]*") | .string | ltrimstr(" ")] | first;
(.text // "") as $t
| ([levels[] | select(.[1] as $re | $t | test($re))] | first) as $hit
| ([$t | capture("(?<n>[1-5]) out of 5") | .n | tonumber] | first) as $stated
| (($stated // $hit[0]) // 3) as $score
| {
    decision: (if $score >= 4 or ($score == 3 and ($t | leans_negative | not)) then "positive" else "negative" end),
    score: $score,
    evidence: (if $hit then [{field: "text", quote: ($t | sentence($hit[1]))}] else [] end)
  }
