{decision: (if .flag == true or .flag == "true" then "yes" else "no" end), score: ((.score // 0) | tonumber)}
