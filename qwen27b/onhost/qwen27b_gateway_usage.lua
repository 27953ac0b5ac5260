-- qwen27b gateway: tokens used per key name, counted from the responses themselves (issue 28).
--
-- Run by nginx's Lua module (libnginx-mod-http-lua, from the OS archive) on the gateway host:
--   body_filter  reads the last "usage" object of a response as it passes: a completion's, or a
--                stream's final chunk when the client asked for stream_options.include_usage (a
--                stream without it counts as a request, no tokens); the two counts go to
--                $qwen27b_prompt_tokens / $qwen27b_completion_tokens (the request log's fields);
--                with log_bodies (qwen27b_gateway_log_bodies) it also keeps the first HEAD bytes of
--                the answer for the request log ($qwen27b_response_body), at most BODY_ESCAPED escaped
--   log          adds the request to its key's counters in the shared dict qwen27b_usage
--   budget       (access) refuses a key over its tokens_per_day until midnight UTC: 429, Retry-After;
--                $qwen27b_limit_tokens says PASSED or REJECTED in the request log. A request it passes
--                reserves its most (the prompt's bytes / 4 + max_tokens, else RESERVE_DEFAULT) on the
--                day at once, settled at the log phase to the usage its answer reported: requests in
--                flight at the same time cannot all pass on one remaining token (issue 51); an answer
--                that reported no usage keeps its reservation (the prompt's estimate only where the
--                client left first, nothing where the request failed)
--   metrics      prints the counters in Prometheus' text format, labelled by key name (never the key)
--   restore/keep (init_worker) the counters survive a restart of nginx (issue 56): the first worker
--                to start loads M.state_file into the empty shared dict; worker 0 writes the dict there
--                every SAVE_EVERY s and when it exits (a reload, a stop), to a new name renamed over it
-- Why Lua: open-source nginx cannot read a response body otherwise, and a proxy of our own would be
-- a second hop to keep (docs/scale-out.md). Interpreted only (the unit denies W+X memory: no JIT).
local M = {budgets = {}, log_bodies = false, state_file = nil}  -- budgets: key name -> tokens_per_day; set by init_by_lua

local OVERLAP = 600  -- the end of what passed, kept to read a usage object split across two buffers
local HEAD = 65536  -- the answer's start kept for the request log (journald takes a line this long)
-- each logged body's most, JSON-escaped as nginx's escape=json writes it: the two and the bodies
-- line's other fields fit one datagram of the journal's syslog socket (nginx's 208 KiB socket buffer)
local BODY_ESCAPED = 98304
local RESERVE_DEFAULT = 1024  -- completion tokens reserved for a request that names no max_tokens
local BYTES_PER_TOKEN = 4  -- the prompt's estimate until its usage arrives (bytes of the request body)
local SAVE_EVERY = 5  -- seconds between two writes of the counters to M.state_file
local DAY_TTL = 2 * 86400  -- a day's tokens are kept two days
local FIELDS = {
    {"requests", "qwen27b_gateway_requests_total", "Requests with this client key."},
    {"errors", "qwen27b_gateway_errors_total", "Requests answered 400 or more (429s included)."},
    {"limited", "qwen27b_gateway_limited_total", "Requests refused by one of the key's limits (429)."},
    {"prompt_tokens", "qwen27b_gateway_prompt_tokens_total", "Prompt tokens, from each response's usage."},
    {"completion_tokens", "qwen27b_gateway_completion_tokens_total", "Completion tokens, from each response's usage."},
    {"seconds", "qwen27b_gateway_request_seconds_total", "Seconds spent answering the key's requests."},
}

-- the last usage object in `text` into the request's two variables (a later, fuller one wins)
local function read_usage(text)
    local at, from = nil, 1
    while true do
        local i = string.find(text, '"usage"%s*:%s*{', from)
        if not i then
            break
        end
        at, from = i, i + 1
    end
    if not at then
        return
    end
    local usage = string.sub(text, at, at + 512)
    -- chat and completions name them prompt/completion_tokens; responses and messages input/output_tokens
    local prompt = string.match(usage, '"prompt_tokens"%s*:%s*(%d+)') or string.match(usage, '"input_tokens"%s*:%s*(%d+)')
    local completion = string.match(usage, '"completion_tokens"%s*:%s*(%d+)')
        or string.match(usage, '"output_tokens"%s*:%s*(%d+)')
    if prompt or completion then
        ngx.var.qwen27b_prompt_tokens = prompt or ""
        ngx.var.qwen27b_completion_tokens = completion or ""
    end
end

-- a text's length once nginx's escape=json has written it: " \\ and \b \f \n \r \t take two bytes,
-- the other bytes below 0x20 six (\u00XX), every other byte one
local function escaped_len(text)
    local _, two = string.gsub(text, '[\\"\b\f\n\r\t]', "")
    local _, six = string.gsub(text, "[%z\1-\7\11\14-\31]", "")
    return #text + two + 5 * six
end

-- `text`'s longest start (whole UTF-8 characters) that escapes to `room` bytes at most, and its escaped length
local function fit(text, room)
    if room <= 0 then
        return "", 0
    end
    local n = escaped_len(text)
    while n > room do
        text = string.sub(text, 1, math.max(0, math.floor(#text * room / n) - 1))
        text = string.gsub(text, "[\192-\255][\128-\191]*$", "")  -- no character cut in two
        n = escaped_len(text)
    end
    return text, n
end

function M.body_filter()
    local chunk, eof = ngx.arg[1], ngx.arg[2]
    local ctx = ngx.ctx
    if chunk and #chunk > 0 then
        local before = ctx.qwen27b_tail or ""
        -- read as it passes (with the end of what came before: an object split across two buffers):
        -- a client that closes right after a stream's [DONE] ends the request before nginx has the
        -- response's last buffer, and the tokens it was sent must still count
        local window = before .. chunk
        read_usage(window)
        ctx.qwen27b_tail = string.sub(window, -OVERLAP)
        local head = ctx.qwen27b_head or ""
        if M.log_bodies and #head < HEAD and not ctx.qwen27b_head_full then
            -- each piece escaped once, as it comes: the head stays under BODY_ESCAPED in linear time
            local used = ctx.qwen27b_head_escaped or 0
            local piece, n = fit(string.sub(chunk, 1, HEAD - #head), BODY_ESCAPED - used)
            ctx.qwen27b_head_full = used + n + 6 > BODY_ESCAPED
            ctx.qwen27b_head, ctx.qwen27b_head_escaped = head .. piece, used + n
            ngx.var.qwen27b_response_body = ctx.qwen27b_head
        end
    end
    if eof then
        ctx.qwen27b_tail = nil
    end
end

local function day_key(name)
    return "day\t" .. os.date("!%Y-%m-%d", ngx.time()) .. "\t" .. name
end

-- the request's body as sent (nginx keeps a large one in a temp file)
local function request_body()
    ngx.req.read_body()
    local body = ngx.req.get_body_data()
    if body then
        return body
    end
    local file = ngx.req.get_body_file()
    local fh = file and io.open(file, "rb")
    if not fh then
        return ""
    end
    body = fh:read("*a")
    fh:close()
    return body or ""
end

-- the most completion tokens the request asks for: the largest max_tokens, max_completion_tokens or
-- max_output_tokens anywhere in it (read as text: a nested one can raise the reservation, never lower it)
local function requested_cap(body)
    local cap
    for _, name in ipairs({"max_tokens", "max_completion_tokens", "max_output_tokens"}) do
        for n in string.gmatch(body, '"' .. name .. '"%s*:%s*(%d+)') do
            n = tonumber(n)
            if not cap or n > cap then
                cap = n
            end
        end
    end
    return cap
end

-- access: a key over its tokens of the UTC day (M.budgets, from the key's tokens_per_day) gets
-- OpenAI's 429 with Retry-After until midnight UTC; a request let through reserves its most at once
-- With log_bodies, the request's body for the request log ($qwen27b_request_body), cut to BODY_ESCAPED.
function M.budget()
    local name = ngx.var.qwen27b_client
    local body
    if M.log_bodies then
        body = request_body()
        ngx.var.qwen27b_request_body = (fit(body, BODY_ESCAPED))
    end
    local limit = name and M.budgets[name]
    if not limit then
        return
    end
    local counters, day = ngx.shared.qwen27b_usage, day_key(name)
    local used = counters:get(day) or 0
    if used < limit then
        ngx.var.qwen27b_limit_tokens = "PASSED"
        body = body or request_body()
        local prompt = math.ceil(#body / BYTES_PER_TOKEN)
        local reserve = prompt + (requested_cap(body) or RESERVE_DEFAULT)
        counters:incr(day, reserve, 0, DAY_TTL)
        ngx.ctx.qwen27b_reserved, ngx.ctx.qwen27b_day, ngx.ctx.qwen27b_prompt_estimate = reserve, day, prompt
        return
    end
    ngx.var.qwen27b_limit_tokens = "REJECTED"
    local wait = 86400 - ngx.time() % 86400
    ngx.status = 429
    ngx.header["Retry-After"] = tostring(wait)
    ngx.header.content_type = "application/json"
    ngx.say(string.format('{"error": {"message": "key %s is over its tokens per day (%d of %d used); retry after %d s '
        .. '(midnight UTC)", "type": "rate_limit_error", "code": "rate_limit_exceeded"}}', name, used, limit, wait))
    return ngx.exit(ngx.HTTP_OK)
end

function M.log()
    local name = ngx.var.qwen27b_client
    if name == nil or name == "" then
        return
    end
    local counters, status = ngx.shared.qwen27b_usage, ngx.status
    counters:incr("requests\t" .. name, 1, 0)
    if status >= 400 then
        counters:incr("errors\t" .. name, 1, 0)
    end
    if status == 429 then
        counters:incr("limited\t" .. name, 1, 0)
    end
    local prompt, completion = tonumber(ngx.var.qwen27b_prompt_tokens), tonumber(ngx.var.qwen27b_completion_tokens)
    if prompt then
        counters:incr("prompt_tokens\t" .. name, prompt, 0)
    end
    if completion then
        counters:incr("completion_tokens\t" .. name, completion, 0)
    end
    local ctx = ngx.ctx
    if ctx.qwen27b_reserved then  -- settled: what the answer reported replaces what was reserved
        local actual = ctx.qwen27b_reserved  -- an answer with no usage keeps its reservation
        if prompt or completion then
            actual = (prompt or 0) + (completion or 0)
        elseif status == 499 then  -- the client left before any usage: the prompt was read, at most
            actual = ctx.qwen27b_prompt_estimate
        elseif status >= 400 then  -- refused or failed before an answer: nothing generated
            actual = 0
        end
        counters:incr(ctx.qwen27b_day, actual - ctx.qwen27b_reserved, 0, DAY_TTL)
    elseif prompt or completion then  -- today's, for tokens_per_day (kept two days)
        counters:incr(day_key(name), (prompt or 0) + (completion or 0), 0, DAY_TTL)
    end
    counters:incr("seconds\t" .. name, tonumber(ngx.var.request_time) or 0, 0)
end

function M.metrics()
    local counters = ngx.shared.qwen27b_usage
    local by = {}
    for _, key in ipairs(counters:get_keys(0)) do
        local field, name = string.match(key, "^([%a_]+)\t(.+)$")
        if field then
            by[field] = by[field] or {}
            by[field][name] = counters:get(key)
        end
    end
    local out, today = {}, string.match(day_key(""), "^day\t(.-)\t$")
    out[#out + 1] = "# HELP qwen27b_gateway_tokens_today Prompt and completion tokens since midnight UTC (tokens_per_day)."
    out[#out + 1] = "# TYPE qwen27b_gateway_tokens_today gauge"
    local names = {}
    for name in pairs(by["day"] or {}) do
        names[#names + 1] = name
    end
    table.sort(names)
    for _, dated in ipairs(names) do
        local day, name = string.match(dated, "^(.-)\t(.+)$")
        if day == today then
            out[#out + 1] = string.format('qwen27b_gateway_tokens_today{key="%s"} %s', name, tostring(by["day"][dated]))
        end
    end
    out[#out + 1] = "# HELP qwen27b_gateway_tokens_per_day The key's budget of tokens a UTC day (tokens_per_day)."
    out[#out + 1] = "# TYPE qwen27b_gateway_tokens_per_day gauge"
    local budgeted = {}
    for name in pairs(M.budgets) do
        budgeted[#budgeted + 1] = name
    end
    table.sort(budgeted)
    for _, name in ipairs(budgeted) do
        out[#out + 1] = string.format('qwen27b_gateway_tokens_per_day{key="%s"} %d', name, M.budgets[name])
    end
    for _, f in ipairs(FIELDS) do
        out[#out + 1] = "# HELP " .. f[2] .. " " .. f[3]
        out[#out + 1] = "# TYPE " .. f[2] .. " counter"
        local names = {}
        for name in pairs(by[f[1]] or {}) do
            names[#names + 1] = name
        end
        table.sort(names)
        for _, name in ipairs(names) do
            out[#out + 1] = string.format('%s{key="%s"} %s', f[2], name, tostring(by[f[1]][name]))
        end
    end
    ngx.header.content_type = "text/plain; version=0.0.4; charset=utf-8"
    ngx.print(table.concat(out, "\n") .. "\n")
end

-- the shared dict in M.state_file: one line per counter, "<seconds to live or 0>\t<value>\t<key>"
local function save()
    if not M.state_file then
        return
    end
    local counters, out = ngx.shared.qwen27b_usage, {}
    for _, key in ipairs(counters:get_keys(0)) do
        local value = counters:get(key)
        if type(value) == "number" then
            out[#out + 1] = string.format("%d\t%s\t%s", math.ceil(counters:ttl(key) or 0), tostring(value), key)
        end
    end
    local part = M.state_file .. "." .. ngx.worker.pid()
    local fh = io.open(part, "w")
    if not fh then
        ngx.log(ngx.WARN, "qwen27b usage: cannot write ", part, ": the counters are not kept across a restart")
        return
    end
    fh:write(table.concat(out, "\n"), "\n")
    fh:close()
    os.rename(part, M.state_file)
end

-- init_worker: the first worker loads the saved counters (the dict is empty after a start, kept
-- across a reload: loaded once); worker 0 saves them every SAVE_EVERY s and when it exits
function M.keep()
    local counters = ngx.shared.qwen27b_usage
    if M.state_file and counters:add("\tloaded", 1) then
        local fh = io.open(M.state_file, "r")
        if fh then
            for line in fh:lines() do
                local ttl, value, key = string.match(line, "^(%d+)\t([%d.]+)\t(%a[%w_]*\t.+)$")
                if key and tonumber(value) then
                    counters:set(key, tonumber(value), tonumber(ttl))
                end
            end
            fh:close()
        end
    end
    if ngx.worker.id() == 0 then
        local function tick(premature)
            save()
            if not premature then
                ngx.timer.at(SAVE_EVERY, tick)
            end
        end
        ngx.timer.at(SAVE_EVERY, tick)
    end
end

return M
