"""Delayed messages (RocketMQ's schedule/): the records the broker rewrites for delay, timer, transaction
halves and send-back (schedule_message), and the schedule service's progress file (schedule_offsets). The
actor that delivers them is smartgo.broker.actors.schedule_actor."""
