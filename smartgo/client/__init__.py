"""SmartGo's Python client: producers, push and pull consumers, and admin, speaking RocketMQ 4.x.

Blocking API (a private event loop thread per client)::

    from smartgo.client import Producer, PushConsumer, Message, ConsumeResult

    with Producer("PG", "127.0.0.1:9876") as producer:
        result = producer.send(Message("TopicTest", b"hello", tags="TagA", keys="order-1"))
        reply = producer.request(Message("RpcTopic", b"ping"), timeout=3.0)   # request-reply

A transactional producer takes `transaction_listener=` (execute and check, returning a
LocalTransactionState) and sends with `producer.send_in_transaction(msg, arg)`.

    consumer = PushConsumer("CG", "127.0.0.1:9876")
    consumer.subscribe("TopicTest", "TagA || TagB")     # or MessageSelector.by_sql("a > 5")
    consumer.set_listener(lambda msg: ConsumeResult.SUCCESS)
    consumer.start()

A consumer answers a request in its listener with `producer.send(create_reply_message(msg, body))`.

A lite pull consumer is polled (Java's DefaultLitePullConsumer); what poll handed out is committed
at a later poll::

    consumer = LitePullConsumer("CG", "127.0.0.1:9876")
    consumer.subscribe("TopicTest")                       # or consumer.assign(queues)
    consumer.start()
    for msg in consumer.poll(timeout=1.0): ...

asyncio API: AsyncProducer, AsyncPushConsumer, AsyncPullConsumer, AsyncLitePullConsumer, AsyncAdmin
(same methods, awaited; `async with`). See docs/CLIENT.md.
"""

from smartgo.client.admin import AsyncAdmin, ClusterInfo
from smartgo.client.allocate import allocate_averagely, allocate_by_circle, allocate_consistent_hash
from smartgo.client.blocking import Admin, LitePullConsumer, Producer, PullConsumer, PushConsumer
from smartgo.client.config import ClientConfig
from smartgo.client.errors import (BrokerError, ClientError, ClientStateError, MessageError, NoRouteError,
                                   RegistryUnavailableError, RequestTimeoutError, SendTimeoutError)
from smartgo.client.lite_pull_consumer import AsyncLitePullConsumer
from smartgo.client.message import (ConsumeFromWhere, ConsumeResult, Message, MessageExt, MessageModel, MessageQueue,
                                    PullResult, PullStatus, SendResult, SendStatus, create_reply_message, reply_topic)
from smartgo.client.producer import AsyncProducer
from smartgo.client.pull_consumer import AsyncPullConsumer
from smartgo.client.push_consumer import AsyncPushConsumer
from smartgo.client.route import select_by_hash, select_random
from smartgo.client.subscription import MessageSelector, SubscriptionError
from smartgo.client.transaction import LocalTransactionState, TransactionListener, TransactionSendResult
from smartgo.common.acl_sign import AccessConfig

__all__ = ["AccessConfig", "Admin", "AsyncAdmin", "AsyncLitePullConsumer", "AsyncProducer", "AsyncPullConsumer",
           "AsyncPushConsumer", "BrokerError", "ClientConfig", "ClientError", "ClientStateError", "ClusterInfo",
           "ConsumeFromWhere", "ConsumeResult", "LitePullConsumer", "LocalTransactionState", "Message", "MessageError",
           "MessageExt", "MessageModel", "MessageQueue", "MessageSelector", "NoRouteError", "Producer", "PullConsumer",
           "PullResult", "PullStatus", "PushConsumer", "RegistryUnavailableError", "RequestTimeoutError", "SendResult",
           "SendStatus", "SendTimeoutError", "SubscriptionError", "TransactionListener", "TransactionSendResult",
           "allocate_averagely", "allocate_by_circle", "allocate_consistent_hash", "create_reply_message",
           "reply_topic", "select_by_hash", "select_random"]
