'use strict';
// Send messages with ali-ons' Producer (SEND_MESSAGE_V2) and report each SendResult.
// spec: {nameSrv, group, messages: [{topic, tags, keys: [..], body | bodyB64, properties: {..},
//        flag, shardingKey}], credentials, close}
// out:  {results: [{msgId, queueId, queueOffset, sendStatus, brokerName, sentBody}], closeError}

const { Producer, Message } = require('ali-ons');
const { clientOptions, recordError, run } = require('./common');

run(async spec => {
  const producer = new Producer(clientOptions(spec, { producerGroup: spec.group }));
  producer.on('error', recordError);
  await producer.ready();
  const results = [];
  for (const m of spec.messages) {
    const body = m.bodyB64 !== undefined ? Buffer.from(m.bodyB64, 'base64') : Buffer.from(m.body || '');
    const msg = new Message(m.topic, m.tags || null, body);
    if (m.keys) msg.keys = m.keys;
    if (m.flag) msg.flag = m.flag;
    if (m.shardingKey) msg.shardingKey = m.shardingKey;
    for (const [k, v] of Object.entries(m.properties || {})) msg.properties[k] = v;
    const r = await producer.send(msg);
    results.push({
      msgId: r.msgId,
      queueId: Number(r.messageQueue.queueId),
      queueOffset: r.queueOffset,
      sendStatus: r.sendStatus,
      brokerName: r.messageQueue.brokerName,
      // what went on the wire: ali-ons compresses the body in place at 4 KiB and more
      sentBody: msg.body.toString('base64'),
    });
  }
  let closeError = null;
  if (spec.close !== false) {
    try {
      await producer.close();
    } catch (err) {
      closeError = `${err.name}: ${err.message} (code ${err.code})`;
    }
  }
  return { results, closeError };
});
