{matches: [.records[] | select(.record.flag == true) | .id]}
