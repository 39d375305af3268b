"""The mesos cluster backend: the Mesos v1 scheduler HTTP API spoken by the project itself."""
