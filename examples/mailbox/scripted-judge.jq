# [SIMULATED] A keyword judge standing in for a model: a first-person
# report ("I was paged", "I found", "I saw", "I am watching") is first-hand,
# a report of what others said is second-hand. Its precision and recall are
# a property of these rules, not of any model.
def body: .body // "";
def first_person: body | test("\\bI (was paged|found|saw|am watching|confirmed|renewed|rolled back|reverted)|on my dashboards"; "i");
def hearsay: body | test("heard|mentioned|says|forwarded|rumou?r|read in|as reported by others"; "i");
def sentence($re): [body | match("[^.\n]*(" + $re + ")[^.\n]*"; "i") | .string | ltrimstr(" ")] | first;
if first_person then
  {decision: "first_hand",
   system: ((.subject // "") | sub(" (down|spike|errors?|failures?|expired|full|backlog).*$"; ""; "i") | .[0:40]),
   evidence: [{field: "body", quote: sentence("\\bI (was paged|found|saw|am watching|confirmed|renewed|rolled back|reverted)|on my dashboards")}]}
elif hearsay then {decision: "second_hand", evidence: []}
else {decision: "unrelated", evidence: []}
end
