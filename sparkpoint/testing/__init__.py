"""Test tools for users of sparkpoint: `ProcessorTester` runs a keyed stateful step
(your `StatefulProcessor`, a `KeyedAggregate`, a `TumblingWindow`) without Spark.
Importing this package starts no Spark (docs/testing.md)."""

from sparkpoint.testing.harness import ProcessorTester, TesterSnapshot

__all__ = ["ProcessorTester", "TesterSnapshot"]
