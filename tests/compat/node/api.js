'use strict';
// Drive ali-ons' request layer (MQClientAPI) op by op, as its consumer does internally: routes,
// topic creation, offsets, pulls from an exact offset, consumer offsets, heartbeats.
// spec: {nameSrv, credentials, ops: [{op, conn, until, untilOk, untilMs, announce, ...args}]}
// out:  {results: [{op, ok, value | error, code}]}

const { Consumer } = require('ali-ons');
const MQClientAPI = require('ali-ons/lib/mq_client_api');
const PullSysFlag = require('ali-ons/lib/utils/pull_sys_flag');
const { clientOptions, messageToJson, run } = require('./common');

const OPS = {
  async route(api, a) {
    return await api.getTopicRouteInfoFromNameServer(a.topic, 3000);
  },
  async createTopic(api, a) {
    await api.createTopic(a.broker, 'TBW102', {
      topicName: a.topic, readQueueNums: a.queues, writeQueueNums: a.queues, perm: 6,
      topicFilterType: 'SINGLE_TAG', topicSysFlag: 0, order: false,
    }, 3000);
    return true;
  },
  async maxOffset(api, a) {
    return await api.getMaxOffset(a.broker, a.topic, a.queueId, 3000);
  },
  async searchOffset(api, a) {
    return await api.searchOffset(a.broker, a.topic, a.queueId, a.timestamp, 3000);
  },
  async pull(api, a) {
    // with a subscription (FLAG_SUBSCRIPTION) as ali-ons' consumer sends it: no HEART_BEAT needed
    const expression = a.expression === undefined ? '*' : a.expression;
    const r = await api.pullMessage(a.broker, {
      consumerGroup: a.group, topic: a.topic, queueId: a.queueId, queueOffset: a.offset,
      maxMsgNums: a.maxNums || 32,
      sysFlag: PullSysFlag.buildSysFlag(false, !!a.suspendMs, expression !== null, false),
      commitOffset: 0, suspendTimeoutMillis: a.suspendMs || 0,
      subscription: expression, subVersion: Date.now(),
    }, (a.suspendMs || 0) + 5000);
    return {
      pullStatus: r.pullStatus, nextBeginOffset: r.nextBeginOffset, minOffset: r.minOffset,
      maxOffset: r.maxOffset, suggestWhichBrokerId: r.suggestWhichBrokerId,
      messages: r.msgFoundList.map(messageToJson),
    };
  },
  async queryConsumerOffset(api, a) {
    return await api.queryConsumerOffset(a.broker, { consumerGroup: a.group, topic: a.topic, queueId: a.queueId }, 3000);
  },
  async updateConsumerOffset(api, a) {
    await api.updateConsumerOffsetOneway(a.broker, {
      consumerGroup: a.group, topic: a.topic, queueId: a.queueId, commitOffset: a.offset,
    });
    return true;
  },
  // HEART_BEAT with the body ali-ons' push consumer builds (its own subscription data code)
  async heartbeat(api, a) {
    const subscription = Consumer.prototype.buildSubscriptionData(a.group, a.topic, a.expression);
    await api.sendHearbeat(a.broker, {
      clientID: a.clientId,
      consumerDataSet: [{
        groupName: a.group, consumeType: 'CONSUME_PASSIVELY', messageModel: 'CLUSTERING',
        consumeFromWhere: 'CONSUME_FROM_LAST_OFFSET', subscriptionDataSet: [ subscription ], unitMode: false,
      }],
      producerDataSet: [{ groupName: 'CLIENT_INNER_PRODUCER' }],
    }, 3000);
    return subscription;
  },
  async consumerList(api, a) {
    return await api.getConsumerIdListByGroup(a.broker, a.group, 3000);
  },
  async unregisterClient(api, a) {
    await api.unregisterClient(a.broker, a.clientId, a.producerGroup || null, a.consumerGroup || null, 3000);
    return true;
  },
};

run(async spec => {
  // `conn: n` runs an op on client n, a connection of its own (default 0): the broker keeps one
  // client id per connection, so two consumers in one group need two
  const apis = new Map();
  const client = async n => {
    if (!apis.has(n)) {
      const api = new MQClientAPI(clientOptions(spec, {}));
      api.on('error', () => {});
      apis.set(n, api);
      await api.ready();
    }
    return apis.get(n);
  };
  const results = [];
  for (const a of spec.ops) {
    if (a.announce) process.stderr.write(`op ${a.op}\n`);
    // `until`: repeat the op (every 50 ms, at most untilMs) until it returns this value, e.g. to
    // read back what a oneway request stored; `untilOk`: repeat it while it fails
    const deadline = Date.now() + (a.untilMs || 5000);
    let result;
    do {
      try {
        result = { op: a.op, ok: true, value: await OPS[a.op](await client(a.conn || 0), a) };
      } catch (err) {
        result = { op: a.op, ok: false, error: `${err.name}: ${err.message}`, code: err.code };
      }
    } while ((a.until !== undefined && JSON.stringify(result.value) !== JSON.stringify(a.until) ||
              a.untilOk && !result.ok) &&
             Date.now() < deadline && await new Promise(resolve => setTimeout(resolve, 50, true)));
    results.push(result);
  }
  for (const api of apis.values()) await api.close();
  return { results };
});
