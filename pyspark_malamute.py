"""
PySpark's discovery of Python data sources: a top-level module named
``pyspark_<name>`` that exposes ``DefaultSource`` is registered in every
session, so ``spark.read.format("malamute")`` works with no ``register``
call once malamute_pack is installed (:mod:`malamute_pack.spark.source`).

Tests: ``tests/system/test_spark_units.py``, ``tests/system/test_spark.py``.
"""

from malamute_pack.spark.source import MalamuteDataSource as DefaultSource

__all__ = ["DefaultSource"]
