"""A rebalance listener for tests: it records what it was told, in order."""


class Recorder:
    def __init__(self):
        self.events = []

    def on_partitions_revoked(self, revoked):
        self.events.append(("revoked", sorted(tp.partition for tp in revoked)))

    def on_partitions_assigned(self, assigned):
        self.events.append(("assigned", sorted(tp.partition for tp in assigned)))
