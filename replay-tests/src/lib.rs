//! Replay tests: recorded event logs (checked in as data) replayed through every projection and compared
//! with checked-in snapshots. The recordings and their checks arrive with the projections issue.
