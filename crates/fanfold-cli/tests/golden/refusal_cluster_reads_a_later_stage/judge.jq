{decision: (if .flag then "yes" else "no" end), topic: .topic}
