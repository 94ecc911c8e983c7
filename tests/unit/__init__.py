"""Unit tests: in this process, no sleeps, no network beyond loopback sockets."""
