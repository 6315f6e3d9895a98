# [SIMULATED] A keyword judge standing in for a model in tests. It reads
# only the fields the stage projects, like a model would; its precision and
# recall are a property of these rules, not of any model. A severe line
# without failure words is `unsure` alone; beside its neighbours (the
# widened context lists them under `related`) it is a failure when one of
# them is.
def failing_text: test("fail|error|exception|interrupt|terminated|assert|lost|cannot"; "i")
  and (test("corrected"; "i") | not);
def failing: (.Content // "") | failing_text;
def severe: .Level == "FATAL" or .Level == "FAILURE" or .Level == "SEVERE" or .Level == "ERROR";
def kinds: [
  ["memory", "TLB|cache|memory|parity"],
  ["storage", "mount|lustre|file system|disk"],
  ["network", "torus|tree|ethernet|link|connection"],
  ["job_terminated", "terminated|killed"],
  ["application_io", "stream|read|write|message"]
];
def quote($re): [(.Content // "") | match("[^.;]*(" + $re + ")[^.;]*"; "i") | .string] | first;
. as $u
| [kinds[] | select(.[1] as $re | $u.Content // "" | test($re; "i"))] as $hits
| (if ($hits | length) > 0 then $hits[0] else ["other", "fail|error|exception|interrupt|assert|lost|cannot"] end) as $kind
| (if failing then "failure"
   elif (severe | not) then "not_failure"
   elif $u.related == null then "unsure"
   elif any($u.related[]; .record | failing) then "failure"
   else "not_failure" end) as $decision
| ($u | if failing then quote($kind[1]) else .Content end | if . == null then null else .[0:120] end) as $q
| {
    decision: $decision,
    kind: (if $decision == "failure" then $kind[0] else "none" end),
    evidence: (if $decision == "failure" and $q != null and ($q | length) >= 8 then [{field: "Content", quote: $q}] else [] end)
  }
