{decision: (if .stars >= 3 then "yes" else "no" end), score: .stars, film: .film, sentiment: (if .stars >= 3 then "pos" else "neg" end)}
