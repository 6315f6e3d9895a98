# [SIMULATED] The phrase judge of scripted-judge.jq, asked of a pair: each
# review's sentiment by the same rules, compared.
def levels: [
  [1, "waste of two hours|Dreadful|unwatchable"],
  [2, "dull|disappointing|Weak writing"],
  [3, "liked it more than not|won me over|left me cold|did not enjoy"],
  [4, "really good|enjoyed it a lot|Well made"],
  [5, "flawless|masterpiece|Brilliant"]
];
def liked:
  . as $t
  | ([$t | capture("(?<n>[1-5]) out of 5") | .n | tonumber] | first) as $stated
  | ([levels[] | select(.[1] as $re | $t | test($re)) | .[0]] | first) as $worded
  | (($stated // $worded) // 3) as $score
  | $score >= 4 or ($score == 3 and ($t | test("left me cold|did not enjoy") | not));
{decision: (if ((.first // "") | liked) == ((.second // "") | liked) then "same" else "opposite" end)}
