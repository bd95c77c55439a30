-- Rows as another producer leaves them in mensagem_m2m: the JVM service writing
-- its own messages, the JVM relay's outcomes, and other apps' types. The Go relay
-- depends on the columns, not on who wrote them. Each natural_key says what the
-- relay of app "billing" (types order and invoice) must do with the row.
INSERT INTO mensagem_m2m (direction, type, natural_key, payload, status, attempts, last_error, created_at, updated_at, sent_at) VALUES
  ('OUT', 'order',    'deliver-pending',         '{"id": 1}', 'PENDING', 0, NULL,              now() - interval '5 minutes', now() - interval '5 minutes', NULL),
  ('OUT', 'invoice',  'deliver-error-below',     '{"id": 2}', 'ERROR',   2, 'HTTP 503',        now() - interval '4 minutes', now() - interval '1 hour',    NULL),
  ('OUT', 'order',    'skip-sent-by-jvm',        '{"id": 3}', 'SENT',    0, NULL,              now() - interval '3 minutes', now() - interval '3 minutes', now() - interval '3 minutes'),
  ('OUT', 'order',    'skip-dead-at-ceiling',    '{"id": 4}', 'ERROR',   10, 'HTTP 422',       now() - interval '3 minutes', now() - interval '3 minutes', NULL),
  ('OUT', 'order',    'skip-dead-above-ceiling', '{"id": 5}', 'ERROR',   12, 'HTTP 422',       now() - interval '3 minutes', now() - interval '3 minutes', NULL),
  ('IN',  'order',    'skip-inbound',            '{"id": 6}', 'PENDING', 0, NULL,              now() - interval '2 minutes', now() - interval '2 minutes', NULL),
  ('OUT', 'shipment', 'skip-other-apps-type',    '{"id": 7}', 'PENDING', 0, NULL,              now() - interval '2 minutes', now() - interval '2 minutes', NULL),
  ('OUT', 'order',    'deliver-pending-retried', '{"id": 8}', 'PENDING', 3, 'requeued by hand', now() - interval '1 minute', now() - interval '1 minute',  NULL);
