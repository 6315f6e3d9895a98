# [SIMULATED] A keyword judge standing in for a model in tests: it reads
# only the fields the stage projects. Its answers are a property of these
# rules, not of any model.
def blocking: ((.labels // []) | index("release-blocker")) or ((.body // "") | test("block(s)? the 3\\.0 release|release blocker|has to block"; "i"));
if blocking
then {decision: "blocker", evidence: [{field: "title", quote: .title}]}
else {decision: "not_blocker", evidence: [{field: "title", quote: .title}]}
end
