"""Nexmark q3, local item suggestion: who sells in category 10 from Oregon, Idaho or
California, with the id of each such auction.

    sparkpoint run examples/nexmark/q3.py      # input and output: docs/nexmark.md

nexmark-flink:
    SELECT P.name, P.city, P.state, A.id
    FROM auction AS A INNER JOIN person AS P ON A.seller = P.id
    WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')

A regular join, as in Flink: a seller may register long before or after opening an
auction, so no time bound is implied and every row is kept (`StreamJoin`). Both sides
are filtered and cut to the columns the result needs before the join, which is all the
join keeps in state.
"""

from sparkpoint import Pipeline, StreamJoin
from sparkpoint.connectors.nexmark_io import nexmark_input, nexmark_output

pipeline = Pipeline("nexmark-q3")
auctions = pipeline.read(nexmark_input("auction")).transform(
    lambda a: a.where("category = 10").select("id", "seller"))
people = pipeline.read(nexmark_input("person")).transform(
    lambda person: person.where("state IN ('OR', 'ID', 'CA')").select("id", "name", "city", "state"))
(auctions.join(people, StreamJoin("auction-seller", left_on="seller", right_on="id"))
 # The joined rows: id, seller (the auction's), id_right, name, city, state (the person's).
 .map_output(lambda rows: rows.select(["name", "city", "state", "id"]))
 .sink(nexmark_output("q3")))
