# [SIMULATED] A keyword judge standing in for a model in tests and in
# `fanfold selfcheck`. It reads only the fields the stage projects, like a
# model would; its precision and recall are a property of these rules, not
# of any model.
# A maintainer's triage note (a comment that starts "Triage:") counts as
# text; other comments, and anything they ask of a reader, do not.
def triage: [(.comments // [])[] | (if type == "object" then .body else . end) // "" | select(startswith("Triage:"))] | map("\n" + .) | join("");
def text: ((.title // "") + "\n" + (.body // "") + triage);
def has_label($n): any((.labels // [])[]; (if type == "object" then .name else . end) == $n);
def downgraded: text | test("not a (release )?blocker|downgrading"; "i");
def blocking:
  (has_label("release-blocker") or (text | test("block(s|ing)? (the )?(v)?3\\.0|release blocker|blocker (for|list)|has to block"; "i")))
  and (downgraded | not);
def new_path: text | test("auth/v2|auth::v2|new_auth_path`?: enabled|new auth(entication)? (path|service)|new login|OIDC"; "i");
def legacy: text | test("auth/v1|legacy|LDAP"; "i");
def incidental: text | test("chart|search results"; "i");
def causes: [
  ["token_refresh_race", "refresh token|refresh(es)? (overlap|race)|concurrent(ly)? refresh|invalid_grant|reuse detect"],
  ["sso_redirect_loop", "redirect(s|ed|ing)? (loop|back)|TOO_MANY_REDIRECTS|ping-pong|back and forth|redirects .*forever"],
  ["session_cookie_scope", "cookie"],
  ["clock_skew", "clock|skew|\\biat\\b|\\bnbf\\b"],
  ["scope_mapping", "scope|claim|group mapping|role"]
];
def sentence($re): [(.body // "") | match("[^.\n]*(" + $re + ")[^.\n]*"; "i") | .string] | first;
# A cluster context (`items` at a `level`) is themed by the first cause
# its quote names; themes are merged by label. Each label's first item is
# its exemplar.
def theme_of: (.view.quote // "") as $q | ([causes[] | select(.[1] as $re | $q | test($re; "i")) | .[0]] | first) // "other";
def position($x): . as $a | first(range($a | length) | select($a[.] == $x));
def themes(key):
  . as $items
  | (map(key) | unique) as $labels
  | {themes: $labels,
     assign: (reduce range($items | length) as $n ({};
       ($items[$n] | key) as $k
       | . + {($items[$n].id): {
           theme: (($labels | position($k)) + 1),
           as: (if any($items[:$n][]; key == $k) then "member" else "exemplar" end)}}))};
if has("items") and has("level") then
  if .level == 0 then .items | themes(theme_of) else .items | themes(.view.theme) end
else
. as $u
| [causes[] | select(.[1] as $re | $u | text | test($re; "i"))] as $hits
| (if ($hits | length) > 0 then $hits[0] else ["other", "auth/v2|new_auth_path|OIDC"] end) as $cause
| (if blocking and new_path and (legacy | not) and (incidental | not) then "blocker" else "not_blocker" end) as $verdict
# Told its comments are still unread, the judge will not rule on a
# new-path issue that carries no release-blocker label.
| (if .comments_pending == true and new_path and (has_label("release-blocker") | not) then "unsure" else $verdict end) as $decision
| ($u | sentence($cause[1]) | if . == null then null else .[0:120] end) as $quote
| {
    decision: $decision,
    cause: (if $decision == "blocker" then $cause[0] else "none" end),
    evidence: (if $decision == "blocker" and $quote != null and ($quote | length) >= 8 then [{field: "body", quote: $quote}] else [] end)
  }
end
