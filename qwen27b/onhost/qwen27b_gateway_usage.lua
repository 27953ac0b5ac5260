-- qwen27b gateway: tokens used per key name, counted from the responses themselves (issue 28).
--
-- Run by nginx's Lua module (libnginx-mod-http-lua, from the OS archive) on the gateway host:
--   body_filter  reads the last "usage" object of a response as it passes: a completion's, or a
--                stream's final chunk when the client asked for stream_options.include_usage (a
--                stream without it counts as a request, no tokens); the two counts go to
--                $qwen27b_prompt_tokens / $qwen27b_completion_tokens (the request log's fields);
--                with log_bodies (qwen27b_gateway_log_bodies) it also keeps the first HEAD bytes of
--                the answer for the request log ($qwen27b_response_body)
--   log          adds the request to its key's counters in the shared dict qwen27b_usage
--   budget       (access) refuses a key over its tokens_per_day until midnight UTC: 429, Retry-After;
--                $qwen27b_limit_tokens says PASSED or REJECTED in the request log
--   metrics      prints the counters in Prometheus' text format, labelled by key name (never the key)
-- Why Lua: open-source nginx cannot read a response body otherwise, and a proxy of our own would be
-- a second hop to keep (docs/scale-out.md). Interpreted only (the unit denies W+X memory: no JIT).
local M = {budgets = {}, log_bodies = false}  -- budgets: key name -> tokens_per_day; both set by the config's init_by_lua

local OVERLAP = 600  -- the end of what passed, kept to read a usage object split across two buffers
local HEAD = 65536  -- the answer's start kept for the request log (journald takes a line this long)
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
    local prompt = string.match(usage, '"prompt_tokens"%s*:%s*(%d+)')
    local completion = string.match(usage, '"completion_tokens"%s*:%s*(%d+)')
    if prompt or completion then
        ngx.var.qwen27b_prompt_tokens = prompt or ""
        ngx.var.qwen27b_completion_tokens = completion or ""
    end
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
        if M.log_bodies and #head < HEAD then
            ctx.qwen27b_head = head .. string.sub(chunk, 1, HEAD - #head)
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

-- access: a key over its tokens of the UTC day (M.budgets, from the key's tokens_per_day) gets
-- OpenAI's 429 with Retry-After until midnight UTC
function M.budget()
    local name = ngx.var.qwen27b_client
    local limit = name and M.budgets[name]
    if not limit then
        return
    end
    local used = ngx.shared.qwen27b_usage:get(day_key(name)) or 0
    if used < limit then
        ngx.var.qwen27b_limit_tokens = "PASSED"
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
    if prompt or completion then  -- today's, for tokens_per_day (kept two days)
        counters:incr(day_key(name), (prompt or 0) + (completion or 0), 0, 2 * 86400)
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

return M
