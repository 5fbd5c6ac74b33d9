"""The servers the tests run against: a Kafka broker, an S3 API server and a Spark
standalone cluster. They belong to the test tree, not to the installed package; one
broker and one S3 server serve a whole test run (tests/conftest.py), one cluster serves
each cluster test module (tests/cluster/conftest.py)."""
