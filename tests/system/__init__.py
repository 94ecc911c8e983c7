"""System tests: real broker processes, network namespaces, Spark, the browser, kill -9."""
