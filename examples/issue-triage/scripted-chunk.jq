# [SIMULATED] A keyword lister standing in for a model that reads many
# issues in one context (the chunk and long-context strategies of `fanfold
# bench ladder --backend scripted`). Its precision and recall are a property
# of these rules, not of any model.
def text: ((.title // "") + "\n" + (.body // ""));
def labelled: any((.labels // [])[]; (if type == "object" then .name else . end) == "release-blocker");
def blocking: (labelled or (text | test("release blocker|block(s|ing)? (the )?(v)?3\\.0"; "i")))
  and (text | test("not a (release )?blocker|downgrading"; "i") | not);
def new_path: text | test("auth/v2|new_auth_path|OIDC|new login"; "i");
{matches: [.records[] | select(.record | blocking and new_path) | .id]}
