{decision: (if .crash then "yes" else "no" end), component: .component}
