"""The broker actor's control-plane tables (RocketMQ's topic/, subscription/, offset/ and client/ managers):
topics, subscription groups, consumer offsets, client connections, group members, what a pull needs of
its group, and the orderly consumers' queue locks."""
