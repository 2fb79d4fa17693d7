"""A first-come-first-served scheduler with chunked prefill, behind tenantry's adapter protocol."""

from tenantry import Claims, Config, Plan, Scheduled, TenantConfig

BLOCK, POOL, SEATS, BUDGET = 16, 512, 4, 256
CONTEXT = POOL * BLOCK // SEATS                  # each seat's share of the pool: the seats never run out of KV


class TinyFCFS:
    def __init__(self, tenants=()):
        config = Config(tenants=tuple(tenants) or (TenantConfig("default"),), block_size_tokens=BLOCK,
                        num_blocks=POOL, max_num_seqs=SEATS, token_budget=BUDGET, max_context_tokens=CONTEXT)
        self.claims = Claims(config, invariants=("FCFS-TENANT",), describe="tiny FCFS")
        self.queue, self.prompt, self.done, self.last = [], {}, {}, ()

    def add_request(self, request):              # None: queued; or a refusal reason
        if request.prompt_tokens + request.output_tokens > CONTEXT:
            return "too_long"
        self.queue.append(request.request_id)
        self.prompt[request.request_id], self.done[request.request_id] = request.prompt_tokens, 0

    def abort_request(self, request_id):
        if request_id in self.prompt:
            self.queue.remove(request_id)
            del self.prompt[request_id], self.done[request_id]

    def plan_step(self, t_s):
        batch, budget = [], BUDGET
        for rid in self.queue[:SEATS]:           # the oldest requests run, each a chunk of its prompt or a token
            n = min(max(1, self.prompt[rid] - self.done[rid]), budget)
            if n > 0:
                batch.append(Scheduled(rid, n, self.done[rid]))
                budget -= n
        self.last = tuple(batch)
        held = {rid: self.done[rid] for rid in self.queue[:SEATS] if self.done[rid]}
        held.update({s.request_id: s.computed_tokens + s.num_tokens for s in batch})
        return Plan(batch=self.last, blocks={rid: -(-tokens // BLOCK) for rid, tokens in held.items()})

    def take_results(self, results):             # results.tokens: who produced a token; results.finished: who ended
        for s in self.last:
            self.done[s.request_id] += s.num_tokens
        for rid in results.finished:
            self.abort_request(rid)


def make_adapter(tenants=()):
    return TinyFCFS(tenants)
