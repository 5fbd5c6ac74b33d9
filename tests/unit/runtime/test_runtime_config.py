import pytest

from sparkpoint.config import Settings, parse_duration_ms
from sparkpoint.errors import ConfigError


def test_flink_keys_from_yaml_set_and_python(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text("execution:\n  checkpointing:\n    interval: 5 s\n    num-retained: 4\nparallelism.default: 3\n"
                 "spark.conf: {spark.sql.shuffle.partitions: '3'}\n")
    s = Settings.load(f, sets=["execution.checkpointing.interval=1 s"],
                      overrides={"execution.checkpointing.min-pause": "200 ms"})
    assert s.checkpoint_interval_ms == 1000          # --set wins over the file
    assert s.num_retained == 4 and s.parallelism == 3
    assert s.checkpoint_min_pause_ms == 200
    assert s.spark_conf == {"spark.sql.shuffle.partitions": "3"}


@pytest.mark.parametrize("sets, words", [
    (["execution.checkpointing.intervall=1s"], ["unknown configuration key", "did you mean",
                                                  "execution.checkpointing.interval"]),
    (["execution.checkpointing.interval=soon"], ["execution.checkpointing.interval", "'soon'", "duration"]),
    (["parallelism.default=0"], ["parallelism.default", "greater than 0"]),
    (["restart-strategy.type=sometimes"], ["restart-strategy.type", "fixed-delay"]),
    (["parallelism.default=300"], ["exceeds pipeline.max-parallelism"]),
    (["no-equals-sign"], ["expected key=value"]),
])
def test_bad_config_is_one_clear_error(sets, words):
    with pytest.raises(ConfigError) as e:
        Settings.load(sets=sets)
    for w in words:
        assert w in str(e.value)


def test_missing_config_file_is_clear(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        Settings.load(tmp_path / "nope.yaml")


@pytest.mark.parametrize("text, ms", [(500, 500), ("500 ms", 500), ("2 s", 2000), ("1 min", 60000), ("1h", 3600000)])
def test_durations(text, ms):
    assert parse_duration_ms(text) == ms
