#!/usr/bin/env python3
"""The instruction mix of each loop of each kernel in an nvdisasm listing.

Usage: sass_loops.py LISTING [KERNEL_SUBSTRING] [--ptxas PTXAS_LOG] [--min-loop N] [--json]

A loop is the code from a label to a branch back to it. For each loop the
script prints its static size, its tensor-core products (HMMA), special
function calls (MUFU: exp2) and the other instructions by opcode, and the
ratio of all instructions to HMMA. Without a GPU this is the one cost of a
kernel's inner loop we can read: an SM sub-partition issues one instruction a
cycle, so a loop with many instructions per HMMA is bound by issue, not by its
tensor cores. Static counts include branches a given call does not take
(masks, RoPE, the last tile), so they bound the hot path from above.
With --ptxas (the output of nvcc -Xptxas -v) each kernel's registers and
spill bytes are printed too. Loops under --min-loop instructions (40) are
left out: address loops and the like, not the kernels' tile loops.
"""
import collections
import json
import re
import sys


def kernels(lines):
    """{mangled name: [('label', name) | ('ins', text)]} in listing order."""
    out, cur = {}, None
    for line in lines:
        m = re.match(r'^\.text\.(\S+):', line)
        if m:
            cur = out.setdefault(m.group(1), [])
            continue
        if cur is None:
            continue
        m = re.match(r'^(\.L_x_\d+):', line)
        if m:
            cur.append(('label', m.group(1)))
            continue
        m = re.match(r'\s*/\*[0-9a-f]{4,}\*/\s+(.*?);', line)
        if m:
            cur.append(('ins', m.group(1)))
    return out


def opcode(ins):
    ins = re.sub(r'^@!?U?P\w+\s+', '', ins)  # predicate guard
    return ins.split()[0].split('.')[0]


def loops(items, min_size=40):
    labels, code = {}, []
    for kind, text in items:
        if kind == 'label':
            labels[text] = len(code)
        else:
            code.append(text)
    found = []
    for i, ins in enumerate(code):
        m = re.search(r'BRA\s+`?\(?(\.L_x_\d+)', ins)
        if m and m.group(1) in labels and labels[m.group(1)] <= i:
            body = code[labels[m.group(1)]:i + 1]
            if len(body) >= min_size:
                found.append(collections.Counter(opcode(x) for x in body))
    return len(code), found


def short_name(mangled):
    """flash_forward_kernel<1,0> for ..._20flash_forward_kernelILi1ELb0EEEv..."""
    m = re.search(r'\d+([a-z_]+_kernel)(I(.*?)EEv)?', mangled)
    if not m:
        return mangled
    args = re.findall(r'L[a-z](\d+)E', m.group(3) or '')
    return m.group(1) + ('<%s>' % ','.join(args) if args else '')


def ptxas_usage(path):
    """{mangled name: 'R registers, S bytes spilled[, F bytes stack frame]'} from
    an -Xptxas -v log. The stack frame is named when not empty: a register
    array indexed at run time lands there without any spill."""
    usage, cur, spill, frame = {}, None, '', '0'
    for line in open(path):
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            cur = m.group(1)
        m = re.search(r'(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads',
                      line)
        if m:
            frame = m.group(1)
            spill = m.group(2) if m.group(2) == m.group(3) else '%s/%s' % m.groups()[1:]
        m = re.search(r'Used (\d+) registers', line)
        if m and cur:
            usage[cur] = '%s registers, %s bytes spilled' % (m.group(1), spill or '0')
            if frame != '0':
                usage[cur] += ', %s bytes stack frame' % frame
            cur, spill, frame = None, '', '0'
    return usage


def main():
    argv = sys.argv[1:]
    as_json = '--json' in argv
    usage, min_loop = {}, 40
    if '--min-loop' in argv:
        i = argv.index('--min-loop')
        min_loop = int(argv[i + 1])
        del argv[i:i + 2]
    if '--ptxas' in argv:
        i = argv.index('--ptxas')
        usage = ptxas_usage(argv[i + 1])
        del argv[i:i + 2]
    args = [a for a in argv if not a.startswith('--')]
    lines = open(args[0]).read().split('\n')
    want = args[1] if len(args) > 1 else ''
    rows = []
    for name, items in kernels(lines).items():
        if want not in name:
            continue
        _, found = loops(items, min_loop)
        if not found and not usage.get(name):
            continue
        rows.append({'kernel': short_name(name), 'ptxas': usage.get(name, ''), 'loops': [
            {'instructions': sum(c.values()), 'hmma': c['HMMA'], 'mufu': c['MUFU'],
             'mix': dict(c.most_common())} for c in found]})
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        print('%s%s' % (r['kernel'], ' (%s)' % r['ptxas'] if r['ptxas'] else ''))
        for n, loop in enumerate(r['loops']):
            ratio = '%5.1f' % (loop['instructions'] / loop['hmma']) if loop['hmma'] else '    -'
            mix = ' '.join('%s=%d' % kv for kv in list(loop['mix'].items())[:12])
            print('  loop %d: %5d instructions, %3d HMMA, %2d MUFU, %s per HMMA | %s' %
                  (n, loop['instructions'], loop['hmma'], loop['mufu'], ratio, mix))


if __name__ == '__main__':
    main()
