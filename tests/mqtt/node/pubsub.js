'use strict';
// One MQTT.js client, driven by a JSON spec (argv[2]), reporting one JSON object a line on stdout:
//   {url, protocolVersion: 4|5, clientId, subscribe: filter|null, qos, publish: [{topic, payload, qos, retain,
//    userProperties}], expect: n, deadlineMs}
// connects ("connected"), subscribes ("subscribed", granted QoS), publishes each message waiting for its
// acknowledgement ("published"), prints each message it gets ("message") and, once it has `expect` of
// them, disconnects cleanly ("done", exit 0). Any error or the deadline: "fatal" and exit 1.
const mqtt = require('mqtt');

const spec = JSON.parse(process.argv[2]);
const emit = (event, fields) => process.stdout.write(JSON.stringify({ event, ...fields }) + '\n');

function fatal(error) {
  emit('fatal', { error: String(error && error.stack ? error.stack : error) });
  process.exit(1);
}

setTimeout(() => fatal(`deadline of ${spec.deadlineMs} ms passed`), spec.deadlineMs || 30000).unref();

const client = mqtt.connect(spec.url, {
  protocolVersion: spec.protocolVersion,
  clientId: spec.clientId,
  clean: true,
  reconnectPeriod: 0,
  connectTimeout: 10000,
});
const received = [];
let published = false;
let ending = false;

function finishIfDone() {
  if (!ending && published && received.length >= (spec.expect || 0)) {
    ending = true;            // the broker may close the connection first: errors from here on are not ours
    client.end(false, {}, () => {
      emit('done', { received: received.length });
      process.exit(0);
    });
  }
}

client.on('error', (error) => ending || fatal(error));
client.on('close', () => ending || fatal('the connection closed'));
client.on('message', (topic, payload, packet) => {
  const props = packet.properties || {};
  received.push(topic);
  emit('message', { topic, payload: payload.toString('utf8'), qos: packet.qos, retain: packet.retain,
                    userProperties: props.userProperties || null });
  finishIfDone();
});

client.on('connect', async (connack) => {
  try {
    emit('connected', { sessionPresent: connack.sessionPresent });
    if (spec.subscribe) {
      const granted = await client.subscribeAsync(spec.subscribe, { qos: spec.qos || 0 });
      emit('subscribed', { granted: granted.map((g) => g.qos) });
    }
    for (const m of spec.publish || []) {
      const options = { qos: m.qos || 0, retain: !!m.retain };
      if (m.userProperties) options.properties = { userProperties: m.userProperties };
      await client.publishAsync(m.topic, m.payload, options);
    }
    published = true;
    emit('published', { count: (spec.publish || []).length });
    finishIfDone();
  } catch (error) {
    fatal(error);
  }
});
