if .note | startswith("see thread") then {decision: "unsure", needs: ["thread"]} else {decision: (if .flag then "yes" else "no" end), needs: []} end
