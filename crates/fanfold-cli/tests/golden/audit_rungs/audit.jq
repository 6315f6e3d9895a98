{decision: (if .flag == true or .subtle == true then "yes" else "no" end)}
