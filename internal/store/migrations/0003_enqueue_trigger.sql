-- 0003: admitting an input enqueues it. The inbox row is part of the input's
-- own insert, so no code path can store an input without scheduling it.
CREATE TRIGGER inputs_enqueue AFTER INSERT ON inputs
BEGIN
    INSERT INTO inbox (input_id, session_id, state, updated_at)
    VALUES (NEW.id, NEW.session_id, 'pending', NEW.received_at);
END;
