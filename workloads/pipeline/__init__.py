"""Pipeline-parallel group inference: a model split across a group's members, one stage each,
activations streamed member to member, each stage's output committed to by TOPLOC proofs so a
validator accepts the group with one prefill and, on a failure, blames the first faulty stage."""
