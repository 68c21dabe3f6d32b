import t from 'tap'
t.equal(1 + 1 as number, 2)
