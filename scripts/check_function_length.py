#!/usr/bin/env python3
# Usage: scripts/check_function_length.py LIMIT FILE...   (prints FILE:LINE for each longer function)
"""Reports C++/CUDA functions longer than a limit (brace matching on a comment/string-stripped copy)."""
import re, sys, subprocess
def strip(src):
    out=[];i=0;n=len(src)
    while i<n:
        c=src[i]
        if src.startswith('//',i):
            j=src.find('\n',i); j=n if j<0 else j; out.append(' '*(j-i)); i=j
        elif src.startswith('/*',i):
            j=src.find('*/',i+2); j=n if j<0 else j+2; out.append(re.sub(r'[^\n]',' ',src[i:j])); i=j
        elif src.startswith('R"',i):
            m=re.match(r'R"([^(]*)\(',src[i:]); d=m.group(1); j=src.find(')'+d+'"',i); j=n if j<0 else j+len(d)+2
            out.append(re.sub(r'[^\n]',' ',src[i:j])); i=j
        elif c in '"\'':
            j=i+1
            while j<n and src[j]!=c:
                j+= 2 if src[j]=='\\' else 1
            out.append(' '*(j+1-i)); i=j+1
        else: out.append(c); i+=1
    return ''.join(out)
def funcs(path):
    s=strip(open(path,errors='replace').read())
    lines=s.split('\n'); res=[]
    # find '{' whose preceding non-space text ends with ')' or ') const' etc => function body
    stack=[]
    for idx,ch in enumerate(s):
        if ch=='{':
            pre=s[max(0,idx-300):idx].rstrip()
            isf=bool(re.search(r'\)\s*(const|override|final|noexcept|mutable|->\s*[\w:<>,\s\*&]+|\s)*$',pre)) and not re.search(r'\b(if|for|while|switch|catch)\s*\([^()]*(\([^()]*\)[^()]*)*\)\s*$',pre)
            stack.append((idx,isf))
        elif ch=='}':
            if stack:
                st,isf=stack.pop()
                if isf and not any(f for _,f in stack):
                    a=s.count('\n',0,st)+1; b=s.count('\n',0,idx)+1
                    res.append((b-a+1,a,path))
    return res
if __name__ == "__main__":
    lim=int(sys.argv[1]); files=sys.argv[2:]
    for f in files:
        for L,a,p in funcs(f):
            if L>lim: print(f"{p}:{a}: function of {L} lines")
