"""Every way of setting a key reaches the job: Spark settings one at a time
(`--set spark.conf.KEY=VALUE`), YAML numbers and booleans for Spark settings, and
environment variables (`SPARKPOINT_...`), with one clear line for Spark keys given
where sparkpoint's own keys go."""

from __future__ import annotations

import pytest

from sparkpoint.config import Settings
from sparkpoint.errors import ConfigError


def test_set_spark_conf_key_is_one_spark_setting():
    s = Settings.load(sets=["spark.conf.spark.executor.memory=4g", "spark.conf.spark.executor.instances=4"],
                      environ={})
    assert s.spark_conf == {"spark.executor.memory": "4g", "spark.executor.instances": "4"}


def test_set_spark_conf_keys_add_to_the_files_spark_conf(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text("spark.conf:\n  spark.executor.memory: 2g\n  spark.task.maxFailures: 8\n")
    s = Settings.load(f, sets=["spark.conf.spark.executor.memory=4g"], environ={})
    assert s.spark_conf == {"spark.executor.memory": "4g", "spark.task.maxFailures": "8"}


def test_yaml_numbers_and_booleans_under_spark_conf_are_spark_strings(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text("spark:\n  master: spark://m:7077\n  conf:\n    spark.executor.instances: 4\n"
                 "    spark.dynamicAllocation.enabled: false\n    spark.memory.fraction: 0.5\n"
                 "    spark:\n      executor:\n        cores: 2\n")
    s = Settings.load(f, environ={})
    assert s.spark_master == "spark://m:7077"
    assert s.spark_conf == {"spark.executor.instances": "4", "spark.dynamicAllocation.enabled": "false",
                            "spark.memory.fraction": "0.5", "spark.executor.cores": "2"}


def test_a_list_under_spark_conf_is_one_clear_error():
    with pytest.raises(ConfigError) as e:
        Settings.load(sets=["spark.conf={spark.jars: [a.jar, b.jar]}"], environ={})
    assert "spark.conf" in str(e.value) and "spark.jars" in str(e.value) and "single values" in str(e.value)


def test_a_spark_key_without_spark_conf_gets_a_did_you_mean():
    with pytest.raises(ConfigError) as e:
        Settings.load(sets=["spark.executor.memory=2g"], environ={})
    assert "did you mean 'spark.conf.spark.executor.memory'?" in str(e.value)


def test_environment_variables_set_keys():
    env = {"SPARKPOINT_EXECUTION_CHECKPOINTING_DIR": "s3://bucket/chk",
           "SPARKPOINT_PARALLELISM_DEFAULT": "4",
           "SPARKPOINT_EXECUTION_CHECKPOINTING_INTERVAL": "5 s",
           "SPARKPOINT_REST_BIND_ADDRESS": "0.0.0.0", "SPARKPOINT_REST_TOKEN": "t0ken",
           "SPARKPOINT_SPARK_MASTER": "spark://m:7077",
           "SPARKPOINT_SPARK_CONF": "{spark.executor.memory: 4g, spark.executor.instances: 3}",
           "SPARKPOINT_SPARKPOINT_PROGRESS": "false"}
    s = Settings.load(environ=env)
    assert (s.checkpoint_dir, s.parallelism, s.checkpoint_interval_ms) == ("s3://bucket/chk", 4, 5000)
    assert (s.rest_bind_address, s.rest_token, s.spark_master, s.progress) == ("0.0.0.0", "t0ken",
                                                                               "spark://m:7077", False)
    assert s.spark_conf == {"spark.executor.memory": "4g", "spark.executor.instances": "3"}


def test_environment_is_over_the_file_and_under_set(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text("parallelism.default: 2\npipeline.name: from-file\nspark.conf: {spark.a: '1', spark.b: '1'}\n")
    env = {"SPARKPOINT_PARALLELISM_DEFAULT": "3", "SPARKPOINT_PIPELINE_NAME": "from-env",
           "SPARKPOINT_SPARK_CONF": "{spark.b: '2', spark.c: '2'}"}
    s = Settings.load(f, sets=["pipeline.name=from-set", "spark.conf.spark.c=3"], environ=env)
    assert (s.parallelism, s.job_name) == (3, "from-set")
    assert s.spark_conf == {"spark.a": "1", "spark.b": "2", "spark.c": "3"}


def test_other_sparkpoint_variables_are_not_keys():
    s = Settings.load(environ={"SPARKPOINT_LOG_LEVEL": "INFO", "SPARKPOINT_RUNTIME_DIR": "/run/x",
                               "SPARKPOINT_KAFKA_BOOTSTRAP": "h:9092"})
    assert s == Settings.load(environ={})


def test_every_key_has_its_own_environment_variable():
    names = [Settings.env_name(k) for k in Settings.keys()]
    assert len(set(names)) == len(names)
    assert Settings.env_name("rest.bind-address") == "SPARKPOINT_REST_BIND_ADDRESS"


def test_a_misspelt_spark_master_is_suggested_as_itself():
    with pytest.raises(ConfigError) as e:
        Settings.load(sets=["spark.mastr=yarn"], environ={})
    assert "did you mean 'spark.master'?" in str(e.value)


def test_a_near_miss_environment_variable_is_flagged_with_the_right_name(caplog):
    with caplog.at_level("WARNING", logger="sparkpoint.config"):
        s = Settings.load(environ={"SPARKPOINT_EXECUTION_CHECKPOINTING_DIRS": "s3://b/chk"})
    assert s.checkpoint_dir == Settings.load(environ={}).checkpoint_dir
    assert any("SPARKPOINT_EXECUTION_CHECKPOINTING_DIRS is not a configuration key; did you mean "
               "SPARKPOINT_EXECUTION_CHECKPOINTING_DIR (execution.checkpointing.dir)?" in r.getMessage()
               for r in caplog.records)
