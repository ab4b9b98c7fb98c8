"""The fabric's topology (switches, uplinks, NIC rails) read from Slurm's topology.conf and a
rails YAML, so rules can join NIC counters to the switch they plug into."""
