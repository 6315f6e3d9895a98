def position($x): . as $a | first(range($a | length) | select($a[.] == $x));
def themes(key): . as $items | (map(key) | unique) as $labels
  | {themes: $labels, assign: (reduce range($items | length) as $n ({}; ($items[$n] | key) as $k
      | . + {($items[$n].id): {theme: (($labels | position($k)) + 1),
                               as: (if any($items[:$n][]; key == $k) then "member" else "exemplar" end)}}))};
if .level == 0 then .items | themes(.view.topic) else .items | themes(.view.theme) end
