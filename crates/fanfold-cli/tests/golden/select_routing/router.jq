if .kind == "bug" then {choice: "judge", _scores: {judge: 0.9, docs: 0.05, unsure: 0.05}}
elif .kind == "question" then {choice: "judge", _scores: {judge: 0.4, docs: 0.3, unsure: 0.3}}
else {choice: (.text | split(" ") | last)} end
