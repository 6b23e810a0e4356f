import json,sys,statistics as st
t=open(sys.argv[1]).read(); j=json.loads(t[t.index('\n{')+1:t.rindex('}')+1])
arms={a['budgets']:a for a in j['cpu_per_request']}
r=arms['routing']
print(sys.argv[1], 'load', j['loadavg_at_start'][:14], '->', j['loadavg_at_end'][:14], 'rounds', j['rounds'])
for name,a in arms.items():
    p=[x/y for x,y in zip(a['p50_us_per_round'], r['p50_us_per_round'])]
    c=[x/y for x,y in zip(a['envoy_cpu_us_per_round'], r['envoy_cpu_us_per_round'])]
    d=[x-y for x,y in zip(a['p50_us_per_round'], r['p50_us_per_round'])]
    dc=[x-y for x,y in zip(a['envoy_cpu_us_per_round'], r['envoy_cpu_us_per_round'])]
    p99=a.get('p99_us_per_round')
    print(f"{name:16} cpu med {st.median(a['envoy_cpu_us_per_round']):6.1f} least {min(a['envoy_cpu_us_per_round']):6.1f} | cpu ratio/round med {st.median(c):.3f} (+{st.median(dc):.1f} µs) | p50 med {st.median(a['p50_us_per_round']):5.0f} ratio/round med {st.median(p):.3f} (+{st.median(d):.0f} µs)" + (f" | p99 med {st.median(p99):.0f}" if p99 else ""))
