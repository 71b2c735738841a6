'use strict';
// Consume with ali-ons' push Consumer (clustering by default) and report what it received.
// spec: {nameSrv, group, topic, expression, expect, timeoutMs, settleMs, consumeFromWhere,
//        isBroadcast, retryOnce, suspendMs, rebalanceMs, pollRouteMs, credentials}
// retryOnce: the first delivery of each message answers ACTION_RETRY (CONSUMER_SEND_MSG_BACK) and
// is not reported; the redelivery is.
// out:  {messages: [...], timedOut, closeError}
// It stops after `expect` messages plus settleMs (to catch extra or foreign ones), or at timeoutMs.

const { Consumer } = require('ali-ons');
const { clientOptions, messageToJson, recordError, run } = require('./common');

run(async spec => {
  const consumer = new Consumer(clientOptions(spec, {
    consumerGroup: spec.group,
    consumeFromWhere: spec.consumeFromWhere || 'CONSUME_FROM_FIRST_OFFSET',
    isBroadcast: !!spec.isBroadcast,
    brokerSuspendMaxTimeMillis: spec.suspendMs || 3000,
    rebalanceInterval: spec.rebalanceMs || 2000,
    pollNameServerInteval: spec.pollRouteMs || 30000,    // sic: ali-ons' spelling
    persistConsumerOffsetInterval: 1000,
  }));
  consumer.on('error', recordError);
  const messages = [];
  const retried = new Set();
  let reached;
  const enough = new Promise(resolve => { reached = resolve; });
  consumer.subscribe(spec.topic, spec.expression || '*', async msg => {
    if (spec.retryOnce && !retried.has(msg.msgId) && msg.reconsumeTimes === 0) {
      retried.add(msg.msgId);
      return Consumer.ACTION_RETRY;
    }
    messages.push(messageToJson(msg));
    if (messages.length >= spec.expect) reached();
  });
  await consumer.ready();
  const timeout = new Promise(resolve => setTimeout(() => resolve('timeout'), spec.timeoutMs || 20000));
  const timedOut = (await Promise.race([enough, timeout])) === 'timeout';
  if (!timedOut && spec.settleMs) await new Promise(resolve => setTimeout(resolve, spec.settleMs));
  let closeError = null;
  try {
    await consumer.close();
  } catch (err) {
    closeError = `${err.name}: ${err.message} (code ${err.code})`;
  }
  return { messages, timedOut, closeError };
});
